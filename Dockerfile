# The hastate image: the static binary that `make image` builds
# (CGO_ENABLED=0, -trimpath, version stamped) on a distroless base.
# Build it with `make image`; the build context is bin/image/, which holds
# only the binary. Offline, `make image BASE=scratch` needs no base to pull.
#
# The base is pinned by digest: a tag moves (distroless rebuilds it for
# every Debian update), a digest is the exact image that was reviewed. The
# digest below is distroless static-debian12:nonroot's multi-arch index as
# published in 2026-08; it was not pulled from this (offline) machine. To
# check or update it (and the Makefile's BASE, which deploy/test keeps equal):
#   crane digest gcr.io/distroless/static-debian12:nonroot
#   skopeo inspect --format '{{.Digest}}' docker://gcr.io/distroless/static-debian12:nonroot
ARG BASE=gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
FROM ${BASE}
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="hastate" \
      org.opencontainers.image.description="Desired state of HAProxy backend servers, served to HAProxy's agent-check" \
      org.opencontainers.image.source="https://github.com/hastate/hastate" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}"
COPY hastate /hastate
# distroless's nonroot user, numeric so that it also holds on scratch
# (no /etc/passwd) and Kubernetes' runAsNonRoot can check it.
USER 65532:65532
# 9777 agent-check, 9778 HTTP, 9779 raft.
EXPOSE 9777/tcp 9778/tcp 9779/tcp
ENTRYPOINT ["/hastate"]
CMD ["serve"]
