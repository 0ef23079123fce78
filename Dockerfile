# syntax=docker/dockerfile:1
# Static binaries on a distroless base: no shell, no libc, non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The version comes from the build information (the commit of the .git
# copied in: dev+<commit>, or the tag for a tagged commit); VERSION, when
# given (--build-arg VERSION=v1.0.0), replaces it (internal/version).
ARG VERSION=
RUN for b in lockd lockctl fencestore; do \
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/lockd/lockd/internal/version.stamp=${VERSION}" -o /out/$b ./cmd/$b || exit 1; \
    done && \
    mkdir -p /empty-data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# /data must exist and belong to the user lockd runs as (nonroot, 65532)
# before it is declared a volume: Docker fills a new named volume from the
# image's directory, ownership included. Without it the volume is root's
# and lockd cannot create its data dir there. (distroless has no shell to
# mkdir/chown in this stage, hence the copy.)
COPY --from=build --chown=65532:65532 /empty-data /data
USER 65532:65532
VOLUME ["/data"]
EXPOSE 7070 7071
ENV LOCKD_DATA_DIR=/data \
    LOCKD_HTTP_ADDR=0.0.0.0:7070 \
    LOCKD_RAFT_ADDR=0.0.0.0:7071
ENTRYPOINT ["/usr/local/bin/lockd"]
