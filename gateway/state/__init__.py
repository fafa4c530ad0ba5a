"""Request state in Redis, shared by every gateway replica."""
