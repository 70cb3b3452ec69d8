// Live updates from /api/v1/events (filled in with the events stream).
