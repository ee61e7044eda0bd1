"""What the sidecar, the model server and the operator agree on, written once.

Each of the three imports these modules; none of them is imported here, so the contract can
be read (and the CRD's batching schema generated) without any of the parts.
"""
