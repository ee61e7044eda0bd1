"""The sidecar's gRPC front: the Open Inference Protocol's `inference.GRPCInferenceService`
beside the REST routes, over the same DataPlane and batcher.

`codec` turns protocol messages into the sidecar's InferRequest and back, `status` is the
one place domain errors become gRPC status codes, `servicer` holds the thin RPC methods,
`health` keeps `grpc.health.v1.Health` in step with readiness, and `server` starts and
stops it all with the sidecar. `inference_pb2*` are generated from `inference.proto` by
`make grpc`.
"""
