"""Where a request is scheduled: the queue and dispatch of each loaded model version.

``dynamic`` runs one request or one dynamic batch per execution, ``sequence`` batches
stateful models' sequences, ``ensemble`` runs a DAG of models as one; ``rate_limiter``
lets instances of all models share resources."""
