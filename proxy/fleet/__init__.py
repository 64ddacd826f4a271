"""The fleet's state: what every guard and worker pointed at one Redis (redis.url) holds in common. Here the
link (link.py), the guards that share it (presence.py), the replicas' budgets (budget.py) and the keys' quotas
(quotas.py). Imported only when a Redis URL is set."""
