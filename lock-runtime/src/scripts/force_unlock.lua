-- force_unlock: delete a lock whoever holds it, and wake its waiters.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  release channel (PUBLISHed `f` to, so a watcher can tell a
--          forced release from the holder's `1`; waiters take any message
--          other than a handoff as a release)
--
-- returns  1  a lock was deleted
--          0  there was no lock
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', ARGV[1], 'f')
  return 1
end
return 0
