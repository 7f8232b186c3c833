# syntax=docker/dockerfile:1
#
# Countersign: one static binary on a distroless, non-root image.
#
#   docker build -t countersign .
#   docker run --rm -p 8080:8080 --env-file countersign.env \
#     -v "$PWD/policy.yaml:/etc/countersign/policy.yaml:ro" \
#     -e COUNTERSIGN_CONFIG=/etc/countersign/policy.yaml countersign
#
# The build stage is a plain `go build` with the same flags as .ci/run;
# cmd/countersign/build_test.go runs this exact line and checks that the
# result is statically linked, so the image is tested without Docker.
# See docs/deploy.md.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a source change does not re-download them.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/countersign ./cmd/countersign

# static-debian12 has CA certificates and tzdata, no shell, no libc.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/countersign /countersign
USER nonroot
EXPOSE 8080
ENTRYPOINT ["/countersign"]
CMD ["serve"]
