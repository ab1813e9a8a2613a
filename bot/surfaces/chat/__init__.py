"""Chat surfaces. They only translate: every surface calls ``bot.surfaces.chat.commands`` with the
same grammar and shows the same answers (the terminal chat now; Slack joins later)."""
