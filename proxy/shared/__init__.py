"""State shared by every guard and worker through Redis (admission.redis_url): the link (link.py), and the guards
that share it (presence.py). Imported only when a Redis URL is set."""
