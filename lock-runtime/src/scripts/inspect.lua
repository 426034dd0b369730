-- inspect: what the backend records of one lock, read-only.
--
-- KEYS[1]  the lock hash          (a write hold, or a read hold: see read.lua)
-- KEYS[2]  the fair queue         (list of holder ids, oldest first)
--
-- returns  {fields, pttl, queue, now}: the hash's fields and values as a
--          flat list (empty when the lock is free), its remaining lease in
--          ms (-2 when there is none), the queued holder ids, and the
--          server's clock in ms, against which each reader's lease end
--          ('x:' fields) is read (a reader whose end has passed is gone,
--          though scripts drop its fields only at their next call)
local t = redis.call('time')
return {
  redis.call('hgetall', KEYS[1]),
  redis.call('pttl', KEYS[1]),
  redis.call('lrange', KEYS[2], 0, -1),
  tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
}
