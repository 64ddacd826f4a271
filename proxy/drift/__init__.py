"""Drift between the guard's counts and the upstream's: the comparison that `token-guard doctor` reports and that the
start-up check (startup.py) runs once when a front end starts."""
