# One image for every adbill process of the cluster deployment (docker-compose.yml): the streaming job (Spark driver),
# the Spark master and workers (so executors import the same code), the web UI and the traffic producers.
FROM python:3.11-slim-bookworm
# JAVA_HOME: the JDK's folder is named after the architecture (java-17-openjdk-amd64, -arm64, ...); a link of
# one fixed name to wherever `java` is makes the image the same on any of them.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sfn "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17
ENV JAVA_HOME=/usr/lib/jvm/java-17 PYTHONUNBUFFERED=1 ADBILL_HOME=/data ADBILL_DEPS_DIR=/opt/adbill/.deps
WORKDIR /opt/adbill
COPY pyproject.toml README.md requirements.lock ./
COPY attribution attribution
COPY billing billing
COPY producers producers
COPY web web
COPY ops ops
# The locked versions, hashes checked (the lock holds the dev and bench tools too: one lock for every install).
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock \
 && pip install --no-cache-dir --no-deps --no-build-isolation . \
 && adbill deps --jars-only
VOLUME /data
ENTRYPOINT ["adbill"]
