"""The bot's state: SQLAlchemy Core tables, the database connection and its migrations."""
