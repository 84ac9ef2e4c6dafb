"""Bundles on devices: verify, tuning, SSH, deploy, rollouts, inventories and the Ansible engine."""
