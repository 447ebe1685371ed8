"""posttrain's own JSON protocol: the ``/v1/training`` routes and the parsing of their
bodies into the engine's typed requests."""
