# One image for every tfpool service and the CLI: `docker run IMAGE serve scheduler`, `... migrate`.
# The builder installs the runtime dependencies pinned in requirements.lock (only those listed under
# "# runtime" in requirements.in; test and lint tools stay out) and the project into a virtualenv;
# the final stage copies that virtualenv onto a clean base and runs as an unprivileged user.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/tfpool
COPY requirements.in requirements.lock ./
RUN sed -n '/^# runtime/,/^# tests/{/^#/d;p}' requirements.in > runtime.in \
    && /opt/tfpool/bin/pip install --requirement runtime.in --constraint requirements.lock
COPY . .
RUN /opt/tfpool/bin/pip install --no-deps . \
    && /opt/tfpool/bin/tfctl --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/tfpool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 tfpool \
    && useradd --system --uid 10001 --gid tfpool --home-dir /var/lib/tfpool --create-home tfpool
COPY --from=builder /opt/tfpool /opt/tfpool
USER 10001:10001
WORKDIR /var/lib/tfpool
EXPOSE 9443 8080 8070 8001 8090
ENTRYPOINT ["tfctl"]
CMD ["--help"]
