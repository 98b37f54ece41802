"""From a model alias to the deployments one request tries: the plan (`router`), each
deployment's live health (`health`) and cooldowns shared across replicas (`cooldowns`), and
which deployment to try next after a failure (`retry`)."""
