"""An independent gRPC client against a running engram gateway.

Uses Python grpcio (C core, not tonic) and nothing generated from our protos:
every engram message type is learnt through server reflection, so this
proves a stock client can discover and call the API.

Usage: python3 tests/py/grpc_probe.py HOST:PORT API_KEY
Prints one JSON object on stdout: {"upsert": ..., "retrieve": ...}; exits
non-zero with a one-line reason on stderr on any failure.
"""

import json
import sys
import uuid

try:
    import grpc
    from google.protobuf import descriptor_pool, json_format, message_factory
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )
except ImportError as e:
    sys.exit(f"grpc_probe: missing python package ({e}); run tests/py/install_pytools.py")

REQUIRED_SERVICES = ["engram.v1.RetrievalService", "engram.v1.MemoryService", "grpc.health.v1.Health"]
TIMEOUT_S = 60


class ProbeError(Exception):
    pass


def check(cond, what):
    if not cond:
        raise ProbeError(what)


def list_services_v1(channel):
    """grpc.reflection.v1: grpcio-reflection ships only v1alpha stubs, but the
    two versions are the same messages under another package, so the v1alpha
    classes serialize v1 requests byte for byte."""
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    for resp in call(iter([req]), timeout=TIMEOUT_S):
        check(resp.HasField("list_services_response"), f"v1 reflection answered {resp}")
        return [s.name for s in resp.list_services_response.service]
    raise ProbeError("v1 reflection returned no response")


def method(pool, service, name):
    svc = pool.FindServiceByName(service)
    m = svc.methods_by_name.get(name)
    check(m is not None, f"{service} has no method {name} in its reflected descriptor")
    return m


def unary(channel, m, request, metadata):
    """Calls a reflected method with dynamically built request/response classes."""
    req_cls = message_factory.GetMessageClass(m.input_type)
    resp_cls = message_factory.GetMessageClass(m.output_type)
    msg = json_format.ParseDict(request, req_cls())
    call = channel.unary_unary(
        f"/{m.containing_service.full_name}/{m.name}",
        request_serializer=req_cls.SerializeToString,
        response_deserializer=resp_cls.FromString,
    )
    return call(msg, metadata=metadata, timeout=TIMEOUT_S)


def probe(addr, key):
    channel = grpc.insecure_channel(addr)
    try:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
    except grpc.FutureTimeoutError:
        raise ProbeError(f"cannot connect to {addr}")

    # (1) Service list through both reflection versions.
    db = ProtoReflectionDescriptorDatabase(channel)
    listed = list(db.get_services())
    for name in REQUIRED_SERVICES:
        check(name in listed, f"v1alpha reflection does not list {name}: {listed}")
    listed_v1 = list_services_v1(channel)
    for name in REQUIRED_SERVICES:
        check(name in listed_v1, f"v1 reflection does not list {name}: {listed_v1}")

    # (2) Descriptors (and their imports, e.g. google/protobuf/struct.proto)
    # resolved lazily through reflection only.
    pool = descriptor_pool.DescriptorPool(db)
    retrieve = method(pool, "engram.v1.RetrievalService", "Retrieve")
    upsert = method(pool, "engram.v1.MemoryService", "Upsert")
    check(
        retrieve.input_type.full_name == "engram.v1.RetrieveRequest",
        f"Retrieve takes {retrieve.input_type.full_name}",
    )

    # (3) Standard health, no auth.
    health = health_pb2_grpc.HealthStub(channel)
    for service in ["", "engram.v1.RetrievalService", "engram.v1.MemoryService"]:
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S).status
        check(
            status == health_pb2.HealthCheckResponse.SERVING,
            f"health of {service!r} is {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}",
        )

    # (4) Write then read with the caller's key.
    metadata = [("authorization", f"Bearer {key}")]
    marker = uuid.uuid4().hex[:12]
    memory_id = str(uuid.uuid4())
    content = f"The probe {marker} prefers green tea in the afternoon."
    up = unary(
        channel,
        upsert,
        {"memories": [{"id": memory_id, "content": content, "memoryType": "semantic"}]},
        metadata,
    )
    check(len(up.results) == 1 and up.results[0].id == memory_id, f"upsert answered {up}")
    got = unary(
        channel,
        retrieve,
        {"text": f"what does the probe {marker} prefer to drink?", "limit": 3, "noCache": True},
        metadata,
    )
    check(any(r.memory.id == memory_id for r in got.records), f"retrieve missed {memory_id}")
    channel.close()
    return {
        "services": sorted(listed),
        "upsert": json.loads(json_format.MessageToJson(up)),
        "retrieve": json.loads(json_format.MessageToJson(got)),
    }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: grpc_probe.py HOST:PORT API_KEY")
    try:
        out = probe(sys.argv[1], sys.argv[2])
    except ProbeError as e:
        sys.exit(f"grpc_probe: {e}")
    except grpc.RpcError as e:
        sys.exit(f"grpc_probe: rpc failed: {e.code().name}: {e.details()}")
    except KeyError as e:
        sys.exit(f"grpc_probe: not found through reflection: {e}")
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
