#!/usr/bin/python3
"""Container health check: asks rankwatchd's gRPC health service (grpc.health.v1.Health/Check)
and exits 0 when it answers SERVING, 1 otherwise (NOT_SERVING after a storage error, no
answer, a refused connection).

Usage: grpc_health_check.py [ADDRESS (127.0.0.1:7466)] [--service NAME] [--timeout SECONDS]

Only python3-grpcio is needed. Debian packages neither grpc_health_probe nor the Python
health stubs (grpcio-health-checking), so the two one-field messages of
grpc/health/v1/health.proto are encoded here by hand:
  HealthCheckRequest  { string service = 1; }        -> tag 0x0a, length, UTF-8 bytes
  HealthCheckResponse { ServingStatus status = 1; }  -> tag 0x08, varint
"""
import argparse
import sys

import grpc

STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_request(service):
    data = service.encode()
    if not data:
        return b""  # proto3: an empty string is not on the wire
    if len(data) > 127:
        raise ValueError("service name too long")
    return b"\x0a" + bytes([len(data)]) + data


def decode_status(response):
    """The status field of a HealthCheckResponse (0 when absent)."""
    i = 0
    status = 0
    while i < len(response):
        tag = response[i]
        i += 1
        if tag == 0x08:  # field 1, varint
            value, shift = 0, 0
            while True:
                b = response[i]
                i += 1
                value |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            status = value
        else:
            raise ValueError("unexpected field tag 0x%02x in HealthCheckResponse" % tag)
    return status


def main(argv):
    parser = argparse.ArgumentParser(description="gRPC health check for rankwatchd")
    parser.add_argument("address", nargs="?", default="127.0.0.1:7466")
    parser.add_argument("--service", default="", help="service name; empty = the whole server")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    with grpc.insecure_channel(args.address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            response = check(encode_request(args.service), timeout=args.timeout)
        except grpc.RpcError as e:
            print("%s: %s %s" % (args.address, e.code().name, e.details()))
            return 1
    status = STATUS_NAMES.get(decode_status(response), "UNKNOWN")
    print("%s: %s" % (args.address, status))
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
