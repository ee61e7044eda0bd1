"""Several processes that serve REST for one sidecar (`--front-processes N`, N > 1).

The process started as the sidecar binds one listening socket per front (SO_REUSEPORT on
one port, so the kernel spreads connections over them) and starts N front processes, each
handed its socket and one end of a socket pair (`link`). A front parses and checks
requests as a one-process sidecar does and sends each request's items over its link; the
starting process runs the one engine, the model client, gRPC, the settings file and the
model state, so batches form from every front's requests (`hub`). It tells every front the
model's state and the settings as they change, gathers every front's metrics into each
scrape (`pod_metrics`), restarts a front that dies (`pool`: its socket leaves the port at
once where another front listens, which takes the connections that arrive meanwhile), and
leads the drain on SIGTERM (`parent`). A front exits when its link closes: it dies with the sidecar.
"""
