"""YAML configuration files (local, databricks, test), shipped as package data; validated by jobs.platform.config."""
