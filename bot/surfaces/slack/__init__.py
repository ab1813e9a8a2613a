"""The Slack surface: slash command, buttons, plans and progress, over slack-bolt.

It only translates: every command goes to ``bot.surfaces.chat.commands.handle`` and every
decision to the ``Service``. ``surface.SlackSurface`` is what ``runbook serve`` wires in.
"""
