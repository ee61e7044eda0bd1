"""`carpool bench`: a load generator for the sidecar."""
