import sys, time, tempfile
sys.path.insert(0,'.')
from engine.run.workspace import Workspace
files=[f"src/pkg/module_{i}.py" for i in range(25)]+["docs/prd.md","docs/design.md","docs/tasks.md","README.md"]
best=9
for rep in range(30):
    d=tempfile.mkdtemp(); w=Workspace(d); w.create()
    t=time.process_time()
    for f in files: w.write(f, "print('x')\n"*50)
    best=min(best,time.process_time()-t)
print("per write us", best/len(files)*1e6)
