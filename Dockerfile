# One image for every process of the Procfile; the first argument chooses which:
#   docker run IMAGE web | worker | beat | release    (web when none is given)
#   docker run IMAGE b2bhub user create admin --role admin   (any other command)
# It installs with the checkout's own `make install` (a virtualenv in /app/.venv, the
# packaging/oscrypto stand-in for pyas2lib's pin, see docs/install.md), without the test
# suite's tools (EXTRAS=), and runs as the unprivileged user b2bhub. docs/operator-guide.md
# "Containers" says how to run it, and docker-compose.yml is a whole deploy.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv make ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . /app
RUN make install EXTRAS= \
    && rm -rf /root/.cache \
    && useradd --system --user-group --home-dir /var/lib/b2bhub --create-home \
        --uid 10001 b2bhub

# The data directory (the secret key when B2BHUB_SECRET_KEY is unset, filesystem payloads
# when no B2BHUB_PAYLOAD_URL is set) and the working directory, where beat keeps its
# schedule file: the one place the user b2bhub writes. The code in /app stays root's.
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    B2BHUB_DATA_DIR=/var/lib/b2bhub \
    B2BHUB_HOST=0.0.0.0
WORKDIR /var/lib/b2bhub
VOLUME /var/lib/b2bhub
USER b2bhub
EXPOSE 8000
ENTRYPOINT ["/app/packaging/docker/entrypoint.sh"]
CMD ["web"]
