"""job_submit/coda: the plugin entry slurmctld calls, its decision journal and the plugin's
installation.
"""
