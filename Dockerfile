# syntax=docker/dockerfile:1
# Static binaries on a distroless base: no shell, no libc, non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/lockd ./cmd/lockd && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/lockctl ./cmd/lockctl && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/fencestore ./cmd/fencestore && \
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
