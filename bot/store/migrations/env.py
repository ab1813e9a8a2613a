"""Alembic environment: runs on the connection the bot hands over (see bot.store.db)."""

from alembic import context

from bot.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # `alembic` command line: build an engine from the ini's URL
    from sqlalchemy import create_engine

    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
