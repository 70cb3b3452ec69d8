"""The hub's processes: what starts them, keeps them alive and connects them.

``supervisor`` is ``b2bhub run`` (web, workers and beat as children, stopped together);
``gunicorn_conf`` is the web process's settings; ``worker`` is what ``celery -A`` loads;
``celery_app`` binds Celery to the Flask app; ``tasks`` are the thin Celery tasks that
call the engine; ``beat`` is beat's scheduler; ``jobs`` schedules plugins' periodic
jobs; ``hub`` holds each process's services (payload store, plugin registry, wake-up
publisher); ``agent`` is each process's heartbeat and log shipping; ``faults`` the fault
suite's hooks, inert unless set.
"""
