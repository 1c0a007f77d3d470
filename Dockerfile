# kirim's container image: `kirim serve` by default, `kirim worker` with that command
# (docs/deploying.md). Build it from a checkout: docker build -t kirim .
#
# The RUN steps marked "install step" are the ones tests/acceptance/test_packaging.py
# runs, as written, in clean venvs on the test machine (DIST and VENV set to folders
# of its own, `python` a fresh interpreter): what builds and installs here is what
# the tests installed.
ARG PYTHON=3.12

FROM python:${PYTHON}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DIST=/dist
WORKDIR /src
COPY . .
# install step: the sdist, then the wheel from it (PyPA's build)
RUN python -m pip install "build>=1.2" && python -m build --outdir "$DIST" .

FROM python:${PYTHON}-slim-bookworm
# the extras to install: postgres (psycopg), otel, apprise (see docs/deploying.md)
ARG EXTRAS=postgres
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DIST=/dist VENV=/opt/kirim
COPY --from=build /dist /dist
# install step: kirim and its extras in a venv of their own
RUN python -m venv "$VENV" \
    && "$VENV/bin/pip" install "$(ls "$DIST"/kirim-*.whl)[$EXTRAS]" \
    && "$VENV/bin/kirim" --version
# system step (not run by the test: it adds a user to the image): kirim runs unprivileged
RUN rm -rf /dist && useradd --system --create-home --home-dir /var/lib/kirim kirim
ENV PATH=/opt/kirim/bin:$PATH KIRIM_DATABASE_URL=sqlite:////var/lib/kirim/kirim.db
USER kirim
WORKDIR /var/lib/kirim
# mount a kirim.toml at /var/lib/kirim/kirim.toml (or set KIRIM_DATABASE_URL), then
# `kirim migrate` once; SIGTERM stops the worker and the server gracefully
EXPOSE 8000
STOPSIGNAL SIGTERM
CMD ["kirim", "serve", "--host", "0.0.0.0", "--protect-dashboard"]
