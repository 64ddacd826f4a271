"""The least an external processor written with grpcio's asyncio server can cost: it answers every phase "go on" and
does nothing else. The ceiling comparison runs it in token-guard's place (envoy-trivial-processor), as the floor the
transport sets under any Python processor."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc

ANSWERS = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "response_headers": pb.ProcessingResponse(response_headers=pb.HeadersResponse()),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()),
}


class Processor(ext_proc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802 (gRPC's name)
        async for message in requests:
            await context.write(ANSWERS[message.WhichOneof("request")])


async def serve(port: int) -> None:
    server = grpc.aio.server()
    ext_proc.add_ExternalProcessorServicer_to_server(Processor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))
