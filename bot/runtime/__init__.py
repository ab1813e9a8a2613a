"""The long-running process: the HTTP server, leadership among replicas and the
background tasks (engine, scheduler, chat poster).
"""
