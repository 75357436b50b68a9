"""The boundary between Spark and models: pandas UDFs, batching, device placement, broadcast handling."""
