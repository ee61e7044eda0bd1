"""A gRPC caller for `unread_answers`: sends one wide ModelInfer, says "sent", then waits for
its answer, which it reads only if its process is still running (the scenario stops it).

    python grpc_reader.py HOST:PORT ELEMENTS    # prints "sent", then "OK" or "ERR <code>"
"""

from __future__ import annotations

import sys
import time

import grpc
import numpy as np

from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest
from carpool.contract.oip_grpc.inference_pb2_grpc import GRPCInferenceServiceStub


def main(target: str, elements: int) -> None:
    options = [("grpc.max_receive_message_length", 1 << 30)]
    with grpc.insecure_channel(target, options=options) as channel:
        request = ModelInferRequest(model_name="toy")
        request.inputs.add(name="input", datatype="FP32", shape=[1, elements])
        request.raw_input_contents.append(np.zeros(elements, np.float32).tobytes())
        answer = GRPCInferenceServiceStub(channel).ModelInfer.future(request)
        time.sleep(0.3)  # on its way
        print("sent", flush=True)
        try:
            answer.result()
        except grpc.RpcError as error:
            print("ERR", error.code().name, flush=True)
        else:
            print("OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
