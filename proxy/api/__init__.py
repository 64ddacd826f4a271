"""Wire models: what the guard reads from each endpoint's request body, and the body it writes back."""
