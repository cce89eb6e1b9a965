"""The awm Kubernetes operator (kopf): EnvFleet and EnvClaim custom resources.

Lives under ``operator/`` in the repository but is imported as ``awm_operator``: a top-level
package named ``operator`` would shadow the standard library module.
"""
