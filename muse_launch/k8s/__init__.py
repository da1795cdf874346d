"""Kubernetes as a place to run a deployment: the exported manifests applied to a real cluster through its
API server (the official `kubernetes` client, the `k8s` extra), watched until ready, and taken down.

client.py  one connection from a kubeconfig and context
apply.py   server-side apply (strict field validation) and dry runs, refusals as file/object/field problems
"""
