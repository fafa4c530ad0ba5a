"""Generated gRPC stubs for the chorus.v1 wire contracts (make protos)."""
