"""The model server: runs whole batches through a torch model."""
