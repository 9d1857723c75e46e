"""Node profiles published to the controller's store: the drop directory and the munge
credentials that vouch for each drop; the collector merges them and refits the model.
"""
