"""The API's bearer-token check, the work every API request does before its view.

    python bench/api_auth.py --backend embedded postgres [--calls 5000] [--rounds 5]

On a fresh migrated database with one token: ``--rounds`` rounds of ``--calls`` calls of
what ``authenticate_request`` does for a known token (``tokens.authenticate`` and the
commit that ends its transaction), in an app context without HTTP; microseconds of
process CPU per call, each round's and the median. The server's own time on PostgreSQL
(another process) is not counted: this is the Python side of the check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import benchlib


def run(name: str, calls: int, rounds: int) -> list[list[object]]:
    with benchlib.fresh_backend(name) as backend:
        app = benchlib.make_app(backend)
        with app.app_context():
            from b2bhub.config.extensions import db
            from b2bhub.services import tokens
            token = tokens.create_token(db.session, "bench", "viewer")
            db.session.commit()
            figures = []
            for _ in range(rounds):
                began = time.process_time()
                for _ in range(calls):
                    assert tokens.authenticate(db.session, token) is not None
                    db.session.commit()
                figures.append((time.process_time() - began) / calls * 1e6)
                print(f"{name}: {figures[-1]:.1f} us a call", flush=True)
            app.extensions["sqlalchemy"].engines[None].dispose()
        return [[name, calls, rounds, round(statistics.median(figures), 1),
                 round(min(figures), 1), round(max(figures), 1)]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", choices=benchlib.BACKENDS,
                        default=["embedded"])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    benchlib.print_table("environment", ["what", "value"],
                         [list(r) for r in benchlib.environment(args.backend)])
    rows = []
    for name in args.backend:
        rows += run(name, args.calls, args.rounds)
    benchlib.print_table("token check, us of process CPU a call",
                         ["backend", "calls", "rounds", "median", "min", "max"], rows)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
