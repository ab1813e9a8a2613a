"""Where people meet the bot: the command line, the chat grammar, the terminal chat,
Slack and the text they all render. No business rule lives here.
"""
