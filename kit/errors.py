"""The one error a person can fix: the bot refuses and changed nothing."""


class Refused(Exception):
    """The request cannot be done as asked; nothing was changed. The message says why."""
