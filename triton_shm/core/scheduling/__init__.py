"""Where a request is scheduled: the queue and dispatch of each loaded model version.

``interface.Scheduler`` is what every scheduler offers; ``dynamic`` runs one request or
one dynamic batch per execution, ``sequence`` batches stateful models' sequences,
``ensemble`` runs a DAG of models as one; ``pending`` is a queued request and its answer;
``rate_limiter`` lets instances of all models share resources."""
