"""servebook's own version (pyproject.toml says the same): the package face and the CLI re-export it."""
__version__ = "0.1.0"
