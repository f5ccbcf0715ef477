"""The Open Inference Protocol's gRPC definitions: ``open_inference_grpc.proto`` as published in
kserve/open-inference-protocol (``specification/protocol/``, Apache-2.0, header kept), and the modules
``hack/gen-oip-protos`` generates from it."""
