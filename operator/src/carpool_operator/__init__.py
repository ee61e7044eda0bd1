"""The Kubernetes operator: reconciles BatchedModel resources into pods."""
