"""`tea diagnose`: the synthetic Prefix-TEA frontier, oracle-gradient alignment, the QQ tail fit. The watches that
training and reports share (reward hacking, the tail check) are in teacli/monitors/."""
