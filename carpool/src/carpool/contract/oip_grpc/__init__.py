"""The Open Inference Protocol's gRPC messages and service, generated from inference.proto."""
