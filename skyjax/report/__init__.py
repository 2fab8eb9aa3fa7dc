"""skyjax/report"""
