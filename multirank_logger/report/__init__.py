"""Which rank is the problem: findings computed from the query side, rendered as text, HTML and plots."""
