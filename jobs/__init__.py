"""Jobs: one module per job, reading and writing Delta tables and logging to MLflow; the CLI; the Spark session."""
