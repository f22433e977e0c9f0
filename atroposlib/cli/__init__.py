"""Console entry points (`run-api`, ...): thin wrappers over the library."""
