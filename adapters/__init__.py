"""One module or package per external system. Nothing here imports ``bot``."""
