"""The submit decision, pure: the job request, decide(), placement, workload signatures, TRES
strings and GPU co-location.
"""
