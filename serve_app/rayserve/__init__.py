"""The only package that imports ray: deployments, gateway and app builder."""
